"""Mutation check: do the fast tests notice a one-character bug in a core formula?

Each mutation below is one realistic slip (an off-by-one in a mask, a flipped sign, a wrong exponent,
a dropped scale, swapped arguments, eps in the wrong place, a wrong label-smoothing split): a file,
an exact snippet of it, its replacement, and the fast tests that should fail. For each, the script
writes the mutated file into a temporary copy of this checkout (your files are never touched, even
on Ctrl-C: the copy is deleted in a ``finally``), runs ``pytest -x -q`` on those tests with a time
limit, and prints ``killed`` (a test failed) or ``SURVIVED`` (every test passed: a bug users would
suffer that no test catches). The last line is ``killed K of N``.

    python benchmarks/mutation_check.py                  # all mutations (about 10 minutes on 2 cores)
    python benchmarks/mutation_check.py --only alibi     # those whose name contains "alibi"
    python benchmarks/mutation_check.py --list           # list them, run nothing
    python benchmarks/mutation_check.py --changed-since main   # those in files a branch changed

Why a hand-written list rather than mutmut or cosmic-ray: both generate every mutant of every line.
mutmut 3.8 makes 2,221 mutants of position.py, attention.py, ffn.py, objectives.py, masks.py and
schedules.py alone, most of them in parameter descriptions, error messages and defaults, and it maps
tests to functions by running the whole suite first; cosmic-ray runs a test command per mutant. At
5-15 s per run of even a focused test selection (importing torch is most of it) that is hours to
days on two cores, where this list, aimed at the formulas and paired with the tests that should
catch each mutation, runs in minutes and reads as a specification of what the tests guarantee.

A snippet must occur exactly once in its file; a mutation whose snippet has gone (the code was
edited) is reported ``stale`` and counts as not killed, so the list is kept up to date.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("tfbuilder", "tests", "recipes", "docs", "pyproject.toml", "mkdocs.yml", "README.md")


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository root
    original: str  # occurs exactly once in the file
    replacement: str
    tests: tuple[str, ...]  # pytest arguments: files, node ids, -k expressions


P, M, A = "tfbuilder/model/components/position.py", "tfbuilder/masks.py", "tfbuilder/model/components/attention.py"
DA = "tfbuilder/model/components/differential.py"
POS = ("tests/test_position.py",)
MASKS = ("tests/test_masks.py",)
REFS = ("tests/test_component_references.py",)
MOE = "tfbuilder/model/components/moe.py"
MOE_TESTS = ("tests/test_moe.py",)
OBJ = ("tests/test_objectives.py",)
TRAIN_METRICS = ("tests/test_training_metrics.py",)
HFC = ("tests/test_hf_configs.py",)
HD, HFF = "tfbuilder/interop/hf/decoders.py", ("tests/test_hf_families.py",)
HS, HW = "tfbuilder/interop/hf/sparse.py", "tfbuilder/interop/hf/weights.py"
HR = "tfbuilder/interop/hf/rope.py"
SCHED = ("tests/test_schedules.py",)  # schedules' reference tests
DATA = ("tests/test_data.py", "tests/test_batching.py")
D, SEARCH = "tfbuilder/inference/decoding.py", ("tests/test_decoding_search.py",)
BEAMS, RULES = "tfbuilder/inference/beams.py", "tfbuilder/inference/rules.py"
C, TB = "tfbuilder/inference/continuation.py", "tfbuilder/inference/transformers_beams.py"
PADDED, GEN = ("tests/test_left_padding.py",), ("tests/test_generation_parity.py",)
VARIANTS, BLOCKS = ("tests/test_attention_variants.py",), ("tests/test_blocks.py",)
OPTIMIZERS, PATTERNS = ("tests/test_optimizers.py",), ("tests/test_layer_patterns.py",)
MS, SL, ST = "tfbuilder/spec/model_section.py", "tfbuilder/spec/slots.py", "tfbuilder/spec/stacks.py"
PF, PREFLIGHT = "tfbuilder/train/preflight.py", ("tests/test_preflight.py",)
LOGGERS = ("tests/test_loggers.py", "-k", "mlflow_store or cannot_be_made")
SS, SF, FS = "tfbuilder/data/store.py", "tfbuilder/data/storefiles.py", "tests/test_faults_store.py"
SK = "tfbuilder/data/storelock.py"
TP, FW = "tfbuilder/data/pretrained.py", ("tests/test_faults_weights.py",)
RS, SCALING = "tfbuilder/model/components/rotary_scaling.py", ("tests/test_rotary_scaling.py",)
LP, B = ("tests/test_layer_positions.py",), "tfbuilder/model/builder.py"
JL, DR = "tfbuilder/runs/joblock.py", "tests/test_distributed_runs.py"
BA, TK = "tfbuilder/data/batching.py", "tfbuilder/train/task.py"
RANKS = ("tests/test_data.py", "-k", "global or world or rank")
RANKS_DDP = ("tests/test_ranks.py", "-k", "global_order")  # two processes: about 2 minutes

MUTATIONS: list[Mutation] = [
    # --- positions (Vaswani et al. 2017 sec. 3.5; Su et al. 2021; Press et al. 2022; Raffel et al. 2020)
    Mutation("sinusoid: sin and cos swapped", P, "pe[..., 0::2] = torch.sin(pos * inv_freq)", "pe[..., 0::2] = torch.cos(pos * inv_freq)", POS),
    Mutation("sinusoid: frequency sign flipped", P, "(-math.log(base) / d)", "(math.log(base) / d)", POS),
    Mutation("sinusoid: positions start at offset+1", P, "torch.arange(offset, offset + n, dtype=torch.float64", "torch.arange(offset + 1, offset + n + 1, dtype=torch.float64", POS),
    Mutation("sinusoid: offset dropped past the table", P, "sinusoids(n, self.d_model, base=self.base, offset=offset, device=x.device)", "sinusoids(n, self.d_model, base=self.base, offset=0, device=x.device)", POS),
    Mutation("learned: offset not counted against max_len", P, "if offset + n > max_len:", "if n > max_len:", POS),
    Mutation("rotary: frequency exponent sign", P, "base ** (-torch.arange(0, k, 2", "base ** (torch.arange(0, k, 2", POS),
    Mutation("rotary: frequency over k-1", P, "dtype=torch.float32) / k)", "dtype=torch.float32) / (k - 1))", POS),
    Mutation("rotary: interleaved rotation sign", P, "torch.stack([-odd, even], dim=-1)", "torch.stack([odd, even], dim=-1)", POS),
    Mutation("rotary: half rotation sign", P, "torch.cat([-second, first], dim=-1)", "torch.cat([second, first], dim=-1)", POS),
    Mutation("rotary: half tables laid out interleaved", P, "return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)", "return cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)", POS),
    Mutation("rotary: interleaved tables laid out in halves", P, "return cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)", "return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)", POS),
    Mutation("rotary: cos and sin tables swapped", P, "return x * cos + rotary_partners(x, self.pairing) * sin", "return x * sin + rotary_partners(x, self.pairing) * cos", POS),
    Mutation("rotary: offset dropped past the table", P, "rotary_tables(n, r, base=self.base, offset=offset,", "rotary_tables(n, r, base=self.base, offset=0,", POS),
    Mutation("rotary: table edge off by one", P, "offset + n <= cos.shape[0] and", "offset + n <= cos.shape[0] + 1 and", POS),
    Mutation("alibi: slope exponent off by one", P, "return [start ** (i + 1) for i in range(n)]", "return [start ** i for i in range(n)]", POS),
    Mutation("alibi: odd slopes of the higher power", P, "power_of_two(2 * lower)[0::2]", "power_of_two(2 * lower)[1::2]", REFS + ("-k", "alibi")),
    Mutation("alibi: encoder distance not symmetric", P, "if self.causal else (i - j).abs()", "if self.causal else (i - j)", POS),
    Mutation("alibi: causal distance clamped the wrong way", P, "distance = (i - j).clamp(min=0)", "distance = (i - j).clamp(max=0)", POS),
    Mutation("alibi: query positions ignore the cache offset", P, "i = torch.arange(offset, offset + n_query, device=device)[:, None]", "i = torch.arange(n_query, device=device)[:, None]", POS),
    Mutation("t5: sign of the upper half flipped", P, "out += (n < 0).long() * buckets", "out += (n > 0).long() * buckets", POS),
    Mutation("t5: exact buckets a third", P, "exact = buckets // 2", "exact = buckets // 3", POS),
    Mutation("t5: log over max_distance, not max_distance/exact", P, "math.log(self.max_distance / exact)", "math.log(self.max_distance)", POS),
    Mutation("t5: last bucket out of range", P, "large.clamp(max=buckets - 1)", "large.clamp(max=buckets)", POS),
    Mutation("t5: one exact distance too few", P, "torch.where(n < exact, n,", "torch.where(n < exact - 1, n,", POS),  # (n <= exact is equivalent)
    Mutation("t5: causal distance clamped the wrong way", P, "n = n.clamp(min=0)", "n = n.clamp(max=0)", POS),
    Mutation("t5: query minus key instead of key minus query", P, "self.bucket(j - i)", "self.bucket(i - j)", POS),
    # --- masks
    Mutation("causal mask excludes the query itself", M, "return (j <= i)[None, None]", "return (j < i)[None, None]", MASKS),
    Mutation("causal mask ignores the cache offset", M, "n_key = n_query + offset if n_key is None else n_key\n    i = torch.arange(offset, offset + n_query", "n_key = n_query + offset if n_key is None else n_key\n    i = torch.arange(0, n_query", MASKS),
    Mutation("window: one key too many behind", M, "near = distance < window if causal", "near = distance <= window if causal", MASKS),
    Mutation("window: one key too many on either side", M, "else distance.abs() < window", "else distance.abs() <= window", MASKS),
    Mutation("window: bidirectional sees only behind", M, "else distance.abs() < window", "else distance < window", MASKS),
    Mutation("window ignores the cache offset", M, "otherwise).\"\"\"\n    i = torch.arange(offset, offset + n_query", "otherwise).\"\"\"\n    i = torch.arange(0, n_query", MASKS),
    Mutation("padding mask inverted", M, "return (ids != pad_id)[:, None, None, :]", "return (ids == pad_id)[:, None, None, :]", ("tests/test_components.py", "-k", "padding and multihead")),
    Mutation("combine: or instead of and", M, "out = m if out is None else out & m", "out = m if out is None else out | m", MASKS),
    # --- attention (Vaswani et al. 2017 sec. 3.2; Ainslie et al. 2023; Henry et al. 2020)
    Mutation("attention: 1/d_k instead of 1/sqrt(d_k)", A, "1.0 / math.sqrt(self.key_dim)", "1.0 / self.key_dim", REFS + ("-k", "gqa_is_torch")),
    Mutation("attention: kv heads tiled instead of repeated per group", A, "x.repeat_interleave(self.heads // self.kv_heads, dim=1)", "x.repeat(1, self.heads // self.kv_heads, 1, 1)", REFS + ("-k", "gqa_is_torch")),
    Mutation("attention: cache offset off by one", A, "offset = cache[\"k\"].shape[2] if", "offset = cache[\"k\"].shape[2] + 1 if", POS + ("-k", "cached")),
    Mutation("attention: cached keys rotated from position 0", A, "position.rotate(k, offset, positions)", "position.rotate(k, 0, positions)", POS + ("-k", "cached")),
    Mutation("attention: look-ahead skipped for two queries", A, "if self.causal and not self.cross and n_q > 1:", "if self.causal and not self.cross and n_q > 2:", ("tests/test_attention.py",)),
    Mutation("attention: bias keeps the masked scores", A, "bias.masked_fill(~mask, float(\"-inf\"))", "bias.masked_fill(mask, float(\"-inf\"))", MASKS + REFS + ("-k", "window or kept")),
    Mutation("attention: explicit bias subtracted", A, "else scores + attn_mask", "else scores - attn_mask", REFS + ("-k", "kept")),
    Mutation("qk_norm: keys normalised over positions", A, "F.normalize(k, dim=-1), 1.0", "F.normalize(k, dim=-2), 1.0", ("tests/test_attention.py",)),
    Mutation("qk_norm: temperature d_k instead of sqrt(d_k)", A, "nn.Parameter(torch.tensor(math.sqrt(self.key_dim)))", "nn.Parameter(torch.tensor(float(self.key_dim)))", ("tests/test_attention.py",)),
    # --- norms and feed-forward (Zhang & Sennrich 2019; Nguyen & Salazar 2019; Shazeer 2020; Fedus et al. 2021)
    Mutation("rmsnorm: eps ignored", "tfbuilder/model/components/norm.py", "super().__init__(ctx.d_model, eps=params.eps)\n", "super().__init__(ctx.d_model)\n", REFS + ("-k", "rmsnorm")),
    Mutation("layernorm: eps ignored", "tfbuilder/model/components/norm.py", "super().__init__(ctx.d_model, eps=params.eps, bias=params.bias)", "super().__init__(ctx.d_model, bias=params.bias)", HFC + ("-k", "random_config and (gpt2 or bert)")),
    Mutation("scalenorm: eps bound the wrong way", "tfbuilder/model/components/norm.py", "clamp(min=self.eps)", "clamp(max=self.eps)", REFS + ("-k", "scalenorm")),
    Mutation("scalenorm: initial gain 1/sqrt(d)", "tfbuilder/model/components/norm.py", "self.scale = nn.Parameter(torch.tensor(float(ctx.d_model) ** 0.5))", "self.scale = nn.Parameter(torch.tensor(float(ctx.d_model) ** -0.5))", REFS + ("-k", "scalenorm")),
    Mutation("mlp: activation dropped", "tfbuilder/model/components/ffn.py", "self.ff_out(self.drop(self.act(self.ff_in(x))))", "self.ff_out(self.drop(self.ff_in(x)))", HFC + ("-k", "random_config and gpt2")),
    Mutation("glu: gate and value swapped", "tfbuilder/model/components/ffn.py", "self.act(gate) * value", "self.act(value) * gate", HFC + ("-k", "random_config and llama")),
    Mutation("glu: width rounded down", "tfbuilder/model/components/ffn.py", "return -(-(2 * default_ffn_hidden(d_model)) // 3 // 8) * 8", "return (2 * default_ffn_hidden(d_model)) // 3 // 8 * 8", ("tests/test_ffn.py",)),
    Mutation("moe: router weights not renormalised", "tfbuilder/model/components/moe.py", "            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)\n", "            weights = weights\n", ("tests/test_ffn.py",)),
    Mutation("moe: balancing counts the last choice", "tfbuilder/model/components/moe.py", "F.one_hot(chosen[:, 0]", "F.one_hot(chosen[:, -1]", REFS + ("-k", "balancing")),
    Mutation("moe: capacity rounded down", "tfbuilder/model/components/moe.py", "math.ceil(self.capacity_factor", "math.floor(self.capacity_factor", REFS + ("-k", "static_dispatch")),
    # --- mixture-of-experts routings: DeepSeek-V3 (sigmoid, correction bias, groups, routed scale, shared experts), Qwen2-MoE
    Mutation("moe: sigmoid router scores by softmax", MOE, "logits.sigmoid() if self.sigmoid else", "logits.softmax(dim=-1) if self.sigmoid else", MOE_TESTS + ("-k", "deepseek or sigmoid")),
    Mutation("moe: correction bias in the weights", MOE, "weights = scores.gather(1, chosen)", "weights = choice.gather(1, chosen)", MOE_TESTS + ("-k", "deepseek or correction")),
    Mutation("moe: group score is the best expert's, not the top-2 sum", MOE, "grouped.topk(2, dim=-1).values.sum(", "grouped.topk(1, dim=-1).values.sum(", MOE_TESTS + ("-k", "deepseek or written_out")),
    Mutation("moe: top_groups mask keeps the other groups", MOE, "grouped.masked_fill(~kept[..., None]", "grouped.masked_fill(kept[..., None]", MOE_TESTS + ("-k", "deepseek or written_out")),
    Mutation("moe: group limit never applied", MOE, "        if self.groups > 1:\n", "        if self.groups > 64:\n", MOE_TESTS + ("-k", "deepseek or written_out")),
    Mutation("moe: routed scale dropped", MOE, "return chosen, weights * self.routed_scale, probs", "return chosen, weights, probs", MOE_TESTS + ("-k", "deepseek or written_out")),
    Mutation("moe: shared gate without its sigmoid", MOE, "shared * self.shared_gate(flat).sigmoid()", "shared * self.shared_gate(flat)", MOE_TESTS + ("-k", "qwen2 or shared")),
    Mutation("moe: shared width not times shared_experts", MOE, "self.expert_width() * params.shared_experts", "self.expert_width()", MOE_TESTS + ("-k", "deepseek or shared")),
    Mutation("moe: sigmoid routing not renormalised by default", MOE, "return self.router == \"sigmoid\" or self.top_k > 1", "return self.top_k > 1", MOE_TESTS + ("-k", "normalize")),
    Mutation("moe: normalize: false ignored", MOE, "            return self.normalize\n", "            return True\n", MOE_TESTS + ("-k", "normalize or qwen")),
    Mutation("moe: sigmoid balancing loss over raw scores", MOE, "probs = scores / scores.sum(dim=-1, keepdim=True) if self.sigmoid else scores", "probs = scores", MOE_TESTS + ("-k", "balancing")),
    Mutation("moe: bias update sign", MOE, "torch.sign(load.mean() - load)", "torch.sign(load - load.mean())", MOE_TESTS + ("-k", "bias_update or balances")),
    Mutation("moe: load counted in evaluation", MOE, "if self.training and self.expert_load is not None:", "if self.expert_load is not None:", MOE_TESTS + ("-k", "bias_update")),
    Mutation("moe: load count not restarted", MOE, "        self.expert_load.zero_()\n", "\n", MOE_TESTS + ("-k", "bias_update or balances")),
    Mutation("moe: bias never updated by training", "tfbuilder/train/task.py", "        self.model.balance_routing(", "        (lambda *a: None)(", ("tests/test_training.py", "-k", "correction_bias")),
    Mutation("moe: bias updated from this rank's load alone", "tfbuilder/train/task.py", "self._sum_over_ranks if self.trainer.world_size > 1 else None", "None", MOE_TESTS + ("-k", "summed_over_ranks")),
    # --- residual placement and embeddings (Vaswani et al. 2017; Xiong et al. 2020)
    Mutation("post-norm: norm outside the residual", "tfbuilder/model/blocks.py", "return self.norm(x + self.drop(self.inner(x, **kwargs)))", "return x + self.norm(self.drop(self.inner(x, **kwargs)))", REFS + ("-k", "placement")),
    Mutation("embedding scale d instead of sqrt(d)", "tfbuilder/model/model.py", "self.scale = math.sqrt(tokens.embedding_dim) if scale", "self.scale = float(tokens.embedding_dim) if scale", ("tests/test_parity.py", "-k", "pad_id_other")),
    # --- objectives (Szegedy et al. 2016; Vaswani et al. 2017 sec. 5.4; Devlin et al. 2019)
    Mutation("smoothing: uniform term summed, not averaged", "tfbuilder/train/objectives.py", "row_loss = row_nll if epsilon == 0 else (1 - epsilon) * row_nll - epsilon * logp.mean(dim=-1)", "row_loss = row_nll if epsilon == 0 else (1 - epsilon) * row_nll - epsilon * logp.sum(dim=-1)", OBJ),
    Mutation("smoothing: gradient of the uniform part not divided by vocab", "tfbuilder/train/objectives.py", "g.sub_(epsilon / g.shape[-1])", "g.sub_(epsilon)", OBJ),
    Mutation("smoothing: target gradient 1+eps", "tfbuilder/train/objectives.py", "-(1.0 - epsilon)))", "-(1.0 + epsilon)))", OBJ),
    Mutation("dropout: kept values scaled by 1/p", "tfbuilder/model/dropout.py", ".mul_(1.0 / (1.0 - p))", ".mul_(1.0 / p)", ("tests/test_dropout.py",)),
    Mutation("dropout: drops the share 1 - p", "tfbuilder/model/dropout.py", ".ge_(p)", ".lt_(p)", ("tests/test_dropout.py",)),
    Mutation("dropout: gradient not masked", "tfbuilder/model/dropout.py", "return grad * factor, None", "return grad, None", ("tests/test_dropout.py",)),
    Mutation("loss: gradient from the log-probabilities, not the softmax", "tfbuilder/train/objectives.py", "g = torch.softmax(logits, dim=-1, out=out)", "g = torch.log_softmax(logits, dim=-1, out=out)", OBJ),
    Mutation("loss: ignored rows' gradient kept", "tfbuilder/train/objectives.py", "keep = valid[:, None].to(compute)", "keep = torch.ones_like(valid[:, None], dtype=compute)", OBJ),
    Mutation("loss: a prediction is below the best, not at it", "tfbuilder/train/objectives.py", "(target_logp >= logp.amax(dim=-1))", "(target_logp > logp.amax(dim=-1))", OBJ + TRAIN_METRICS),
    Mutation("loss counts ignored targets", "tfbuilder/train/objectives.py", "valid = t != ignore\n", "valid = t == t\n", OBJ),
    Mutation("plain smoothing: 1+eps on the nll", "tfbuilder/train/objectives.py", "loss = nll if epsilon == 0 else (1 - epsilon) * nll", "loss = nll if epsilon == 0 else (1 + epsilon) * nll", OBJ),
    Mutation("causal lm predicts the current token", "tfbuilder/train/objectives.py", "hidden, tokens[:, 1:], epsilon=epsilon", "hidden, tokens[:, :-1], epsilon=epsilon", OBJ),
    Mutation("masked lm: 70% shown as <mask>", "tfbuilder/train/objectives.py", "chosen & (roll < 0.8)", "chosen & (roll < 0.7)", OBJ),  # (0.9 is equivalent: the random 10% overrides)
    Mutation("masked lm: special tokens may be chosen", "tfbuilder/train/objectives.py", "candidates = tokens >= len(reserved)", "candidates = tokens >= 0", OBJ),
    Mutation("training metrics over every real token", "tfbuilder/train/task.py", "predicted = result.tokens.clamp(min=1)", "predicted = max(size, 1)", ("tests/test_training_metrics.py",)),
    Mutation("residual scaling misses the output projections", "tfbuilder/model/builder.py", "for linear in branch.output_projections():", "for linear in []:", ("tests/test_contracts.py", "-k", "residual_scaling")),
    Mutation("positions built for one head", "tfbuilder/model/builder.py", "return shape.heads, shape.key_dim", "return 1, self.spec.d_model", ("tests/test_contracts.py", "-k", "declared_shape")),
    Mutation("target count includes the first token", "tfbuilder/train/objectives.py", "\"decoder\": lambda: batch[\"tokens\"][:, 1:]", "\"decoder\": lambda: batch[\"tokens\"]", OBJ),
    # --- learning-rate schedules (Vaswani et al. 2017 eq. 3; Loshchilov & Hutter 2017)
    Mutation("inverse_sqrt: warmup^-0.5", "tfbuilder/train/schedules.py", "min(step**-0.5, step * warmup**-1.5)", "min(step**-0.5, step * warmup**-0.5)", SCHED),
    Mutation("inverse_sqrt: d_model^0.5", "tfbuilder/train/schedules.py", "return schedule.scale * d_model**-0.5 * min(", "return schedule.scale * d_model**0.5 * min(", SCHED),
    Mutation("cosine: warmup from step 0", "tfbuilder/train/schedules.py", "return lr * step / max(warmup, 1)", "return lr * (step - 1) / max(warmup, 1)", SCHED),
    Mutation("cosine: rises instead of decays", "tfbuilder/train/schedules.py", "0.5 * (1 + math.cos(math.pi * progress))", "0.5 * (1 - math.cos(math.pi * progress))", SCHED),
    Mutation("constant: warmup from step 0", "tfbuilder/train/schedules.py", "lr * min(1.0, step / warmup)", "lr * min(1.0, (step - 1) / warmup)", SCHED),
    # --- data: batching and collation
    Mutation("token budget: a full batch may not reach the budget", "tfbuilder/data/batching.py", "count * longest_src > max_tokens", "count * longest_src >= max_tokens", DATA),
    Mutation("sentence batches one too large", "tfbuilder/data/batching.py", "np.arange(0, n, batch_size, dtype=np.int64)", "np.arange(0, n, batch_size + 1, dtype=np.int64)", DATA),
    Mutation("ranks: uneven batches kept", "tfbuilder/data/batching.py", "end = done + (count - done) // world * world if even else count", "end = count", DATA),
    Mutation("collate: </s> over the last token", "tfbuilder/data/collate.py", "out[r, start + len(row)] = end", "out[r, start + len(row) - 1] = end", DATA),
    Mutation("collate: tgt_out starts with <s>", "tfbuilder/data/collate.py", "\"tgt_out\": pad(tgt, eos=True, ids=ids)", "\"tgt_out\": pad(tgt, bos=True, ids=ids)", DATA),
    Mutation("lengths: no room for both specials", "tfbuilder/data/collate.py", "(LANGUAGE_MODEL_ADDED, LANGUAGE_MODEL_ADDED)", "(LANGUAGE_MODEL_ADDED - 1, LANGUAGE_MODEL_ADDED - 1)", DATA),
    # --- Hugging Face import: a field read but not used
    Mutation("hf: rope_theta ignored", HR, "\"base\": read_float(named, f\"{where}.rope_theta\", 10000.0)", "\"base\": 10000.0", HFC + ("-k", "random_config and llama")),
    Mutation("hf: rms_norm_eps ignored", HD, "read_float(cfg, \"rms_norm_eps\", fam.eps)", "fam.eps", HFC + ("-k", "random_config and llama")),
    Mutation("hf families: llama3 rope scaling dropped", HR, "position[\"scaling\"] = _llama3(named, where)", "pass", HFF + ("-k", "import_gives and llama")),
    Mutation("hf families: linear rope factor ignored", HR, "\"factor\": read_float(named, f\"{where}.factor\", 1.0)}", "\"factor\": 1.0}", HFF + ("-k", "import_gives and qwen2")),
    Mutation("hf families: partial rotary factor ignored", HR, "position[\"fraction\"] = fraction", "pass", HFF + ("-k", "import_gives and phi3")),
    Mutation("hf families: yarn beta_fast ignored", HR, "\"beta_fast\": read_float(named, f\"{where}.beta_fast\", 32.0)", "\"beta_fast\": 32.0", HFF + ("-k", "import_gives and mistral")),
    Mutation("hf families: yarn truncate ignored", HR, "\"truncate\": require(named, f\"{where}.truncate\", (True, False), True)", "\"truncate\": True", HFF + ("-k", "import_gives and mistral")),
    Mutation("hf families: yarn mscale and attention_factor dropped", HR, "for key in YARN_OPTIONAL:", "for key in ():", HFF + ("-k", "import_gives and qwen3")),
    Mutation("hf families: longrope implicit factor not max over original", HR, "return read_int(named, \"max_position_embeddings\") / original", "return read_int(named, \"max_position_embeddings\") / original / 2", HFF + ("-k", "import_gives and phi3")),
    Mutation("hf families: longrope attention_factor dropped", HR, "scaling[\"attention_factor\"] = read_float(named, f\"{where}.attention_factor\", 1.0)", "pass", HFF + ("-k", "import_gives and olmo2")),
    Mutation("hf families: Phi-3's top-level original_max_position_embeddings ignored", HR, "if top_original and \"original_max_position_embeddings\" in cfg:", "if False:", HFF + ("-k", "phi3_128k")),
    Mutation("hf families: export drops Phi-3's top-level original_max_position_embeddings", HD, "cfg[\"original_max_position_embeddings\"] = original", "pass", HFF + ("-k", "round_trips and phi3")),
    Mutation("hf families: Gemma 3 sliding layers rotate by the full layers' parameters", HD, "kinds[\"local\"][\"position\"] = {\"scaling\": None, **ropes[\"sliding_attention\"]}", "kinds[\"local\"][\"position\"] = {\"scaling\": None, **ropes[\"full_attention\"]}", HFF + ("-k", "import_gives and gemma3")),
    Mutation("hf families: Gemma 3 sliding layers inherit the full layers' scaling", HD, "{\"scaling\": None, **ropes[\"sliding_attention\"]}", "dict(ropes[\"sliding_attention\"])", HFF + ("-k", "import_gives and gemma3")),
    Mutation("hf families: Gemma 3 attention soft-cap applied", HD, "    if not fam.attn_softcap:", "    if False:", HFF + ("-k", "import_gives and gemma3")),
    Mutation("hf families: Gemma 3 q/k norm gains read without the one", "tfbuilder/interop/hf/weights.py", "(f\"{sa}.{n}.weight\",), norm_op) for n in qk]", "(f\"{sa}.{n}.weight\",), \"copy\") for n in qk]", HFF + ("-k", "import_gives and gemma3")),
    Mutation("hf families: Gemma 3 rope_local_base_freq ignored", HR, "\"sliding_attention\": (\"rope_local_base_freq\", 10_000.0)}", "\"sliding_attention\": (\"rope_theta\", 10_000.0)}", HFF + ("-k", "gemma3_configs_on_the_hub")),
    Mutation("hf families: Gemma 3 sliding_window_pattern ignored", HD, "n = read_int(cfg, \"sliding_window_pattern\", fam.sliding_pattern)", "n = fam.sliding_pattern", HFF + ("-k", "gemma3_configs_on_the_hub")),
    Mutation("hf families: Gemma 3 export writes the model's rope for sliding layers", HD, "position = m.position if layer is None else m.layer_components(\"decoder\", layer)[\"position\"]", "position = m.position", HFF + ("-k", "round_trips and gemma3")),
    Mutation("hf families: Qwen3-MoE norm_topk_prob ignored", HD, "ffn[\"normalize\"] = _flag(cfg, fam.moe_normalize, False)", "ffn[\"normalize\"] = False", HFF + ("-k", "import_gives and qwen3_moe")),
    Mutation("hf families: Qwen3-MoE experts' gate and up swapped", "tfbuilder/interop/hf/families.py", "expert_names=(\"mlp\", \"gate_proj\", \"up_proj\", \"down_proj\")", "expert_names=(\"mlp\", \"up_proj\", \"gate_proj\", \"down_proj\")", HFF + ("-k", "import_gives and qwen3_moe")),
    Mutation("hf families: Qwen3-MoE export writes norm_topk_prob false", HD, "fam.moe_normalize: ffn.get(\"normalize\")", "fam.moe_normalize: False", HFF + ("-k", "round_trips and qwen3_moe")),
    Mutation("hf families: Qwen3-MoE num_experts ignored", HD, "ffn[\"experts\"] = read_int(cfg, \"num_experts\", 8)", "pass", HFF + ("-k", "qwen3_moe_configs_on_the_hub")),
    Mutation("hf families: head_dim ignored", HD, "head_dim = read_int(cfg, \"head_dim\", default_head_dim(d, heads))", "head_dim = default_head_dim(d, heads)", HFF + ("-k", "import_gives and mistral")),
    Mutation("hf families: sliding_window ignored", HD, "        model[\"attention\"][\"window\"] = read_int(cfg, \"sliding_window\")", "        pass", HFF + ("-k", "import_gives and mistral")),
    Mutation("hf families: layer pattern shifted by one", HD, "[names[t] for t in types[:period]]", "[names[t] for t in types[1 : period + 1]]", HFF + ("-k", "import_gives and qwen2")),
    Mutation("hf families: q/k/v-only biases read as every bias", HD, "model[\"attention\"][\"bias\"] = \"qkv\"", "model[\"attention\"][\"bias\"] = True", HFF + ("-k", "import_gives and qwen2")),
    Mutation("hf families: qk norm eps not rms_norm_eps", HD, "update(qk_norm=\"rms\", qk_norm_eps=model[\"norm\"][\"eps\"])", "update(qk_norm=\"rms\")", HFF + ("-k", "import_gives and qwen3")),
    Mutation("hf families: query_pre_attn_scalar ignored", HD, "attention[\"scale\"] = scalar**-0.5", "attention[\"scale\"] = attention[\"key_dim\"] ** -0.5", HFF + ("-k", "import_gives and gemma2")),
    Mutation("hf families: final logit softcap ignored", HD, "model[\"logit_softcap\"] = read_float(cfg, \"final_logit_softcapping\", 0.0)", "pass", HFF + ("-k", "import_gives and gemma2")),
    Mutation("hf families: Gemma norm gains read without the one", "tfbuilder/interop/hf/weights.py", "norm_op = \"plus1\" if GEMMA in fam.features else \"copy\"", "norm_op = \"copy\"", HFF + ("-k", "import_gives and gemma2")),
    Mutation("hf families: Gemma norm gains written without minus one", "tfbuilder/interop/hf/weights.py", "out[targets[0]] = (value - 1).contiguous()", "out[targets[0]] = value.contiguous()", HFF + ("-k", "round_trips and gemma2")),
    Mutation("hf families: export drops the sliding window", HD, "return {\"sliding_window\": windows[0]}", "return {\"sliding_window\": None}", HFF + ("-k", "round_trips and mistral")),
    Mutation("hf families: export swaps full and sliding layers", HD, "[\"full_attention\" if w is None else \"sliding_attention\" for w in windows]", "[\"sliding_attention\" if w is None else \"full_attention\" for w in windows]", HFF + ("-k", "round_trips and qwen2")),
    Mutation("hf families: OLMo 2 q/k norm per head", HD, "qk_norm_over=\"all\")", "qk_norm_over=\"head\")", HFF + ("-k", "import_gives and olmo2")),
    Mutation("placement output: the norm before the sub-layer", "tfbuilder/model/blocks.py", "return x + self.drop(self.norm(self.inner(x, **kwargs)))", "return x + self.drop(self.inner(self.norm(x), **kwargs))", REFS + ("-k", "placement")),
    Mutation("qk_norm_over all: channels gathered in the wrong order", A, "rearrange(x, \"b h n k -> b n (h k)\")", "rearrange(x, \"b h n k -> b n (k h)\")", ("tests/test_attention.py", "-k", "over_all")),
    Mutation("hf classify: no pad_token_id written", "tfbuilder/interop/hf/classify.py", "\"pad_token_id\": model.pad_id,", "\"pad_token_id\": None,", HFF + ("-k", "sequence_head_exports")),
    Mutation("sequence head: head.bias false still learns a bias", "tfbuilder/model/heads.py", "nn.Linear(d_model, outputs, bias=bias)", "nn.Linear(d_model, outputs, bias=True)", HFF + ("-k", "sequence_head_exports")),
    Mutation("hf families: Mixtral top_k ignored", HD, "\"top_k\": read_int(cfg, \"num_experts_per_tok\", 2),", "\"top_k\": 2,", HFF + ("-k", "import_gives and mixtral")),
    Mutation("hf families: Mixtral experts' gate and up swapped", "tfbuilder/interop/hf/weights.py", "[f\"{expert}.{gate}\", f\"{expert}.{up}\"]", "[f\"{expert}.{up}\", f\"{expert}.{gate}\"]", HFF + ("-k", "import_gives and mixtral")),
    Mutation("hf families: export writes attention_bias false", HD, "cfg[\"attention_bias\"] = bias is True", "cfg[\"attention_bias\"] = False", HFF + ("-k", "round_trips and llama")),
    Mutation("hf: n_inner ignored", "tfbuilder/interop/hf/configs.py", "_int(cfg, \"n_inner\", 4 * d)", "4 * d", HFC + ("-k", "random_config and gpt2")),
    Mutation("hf: T5 max_distance ignored", "tfbuilder/interop/hf/configs.py", "_int(cfg, \"relative_attention_max_distance\", 128)", "128", HFC + ("-k", "random_config and t5")),
    # --- recent ablations (Gemma 2; PaLM; GPT-J; Qiu et al. 2025; Zhou et al. 2024; Ye et al. 2025; Muon; patterns)
    Mutation("softcap: logits divided instead of scaled", "tfbuilder/train/objectives.py", "logits = softcap * tanh", "logits = softcap / tanh", OBJ + ("-k", "softcap")),
    Mutation("softcap: gradient through the cap with the wrong sign", "tfbuilder/train/objectives.py", "g.mul_(1 - tanh.square())", "g.mul_(1 + tanh.square())", OBJ + ("-k", "softcap")),
    Mutation("softcap: decoding's logits capped at 1/cap", "tfbuilder/model/model.py", "self.softcap * torch.tanh(logits / self.softcap)", "self.softcap * torch.tanh(logits * self.softcap)", OBJ + ("-k", "softcap")),
    Mutation("softcap: attention scores capped at 1/cap", A, "scores = self.softcap * torch.tanh(scores / self.softcap)", "scores = self.softcap * torch.tanh(scores * self.softcap)", VARIANTS + ("-k", "softcap")),
    Mutation("softcap: attention takes the uncapped kernel", A, "if self.keep_weights or self.softcap is not None:  # the fused", "if self.keep_weights:  # the fused", VARIANTS + ("-k", "softcap")),
    Mutation("z-loss: |log Z| instead of log(Z)^2", "tfbuilder/train/objectives.py", "z_loss * log_z.square()", "z_loss * log_z.abs()", OBJ + ("-k", "z_loss")),
    Mutation("z-loss: log Z from the logit plus its log-probability", "tfbuilder/train/objectives.py", "logits.gather(1, target[:, None]).squeeze(1) - target_logp", "logits.gather(1, target[:, None]).squeeze(1) + target_logp", OBJ + ("-k", "z_loss")),
    Mutation("z-loss: gradient factor 3 instead of 2", "tfbuilder/train/objectives.py", "g.mul_(1 + 2 * z_loss", "g.mul_(1 + 3 * z_loss", OBJ + ("-k", "z_loss")),
    Mutation("parallel: feed-forward normalises the attention output", "tfbuilder/model/blocks.py", "else self.ffn.norm(x))", "else self.ffn.norm(attn))", BLOCKS),
    Mutation("parallel: attention branch subtracted", "tfbuilder/model/blocks.py", "return x + attn + self.ffn.branch(", "return x - attn + self.ffn.branch(", BLOCKS),
    Mutation("parallel: shared and separate norms swapped", "tfbuilder/model/builder.py", 'own_norm = not (parallel and spec.parallel_norms == "shared")', 'own_norm = not (parallel and spec.parallel_norms != "shared")', BLOCKS),
    Mutation("gate: tanh instead of sigmoid", A, 'return out * rearrange(scores, "b i h -> b h i 1").sigmoid()', 'return out * rearrange(scores, "b i h -> b h i 1").tanh()', VARIANTS + ("-k", "gated")),
    Mutation("gate: channels split across heads the wrong way", A, '"b i (h v) -> b h i v", h=out.shape[1]).sigmoid()', '"b i (v h) -> b h i v", h=out.shape[1]).sigmoid()', VARIANTS + ("-k", "gated")),
    Mutation("value residual: lambdas swapped", A, "return lambdas[0] * first + lambdas[1] * v", "return lambdas[1] * first + lambdas[0] * v", VARIANTS + ("-k", "value_residual")),
    Mutation("value residual: the second layer's values taken as V_1", A, "        if self.layer == 0:\n            shared.first_values = v", "        if self.layer <= 1:\n            shared.first_values = v", VARIANTS + ("-k", "value_residual")),
    Mutation("differential: lambda_init from l instead of l - 1", DA, "return 0.8 - 0.6 * math.exp(-0.3 * layer)", "return 0.8 - 0.6 * math.exp(-0.3 * (layer + 1))", VARIANTS + ("-k", "differential")),
    Mutation("differential: exp terms added", DA, "return torch.exp(q1k1) - torch.exp(q2k2) + self.lambda_init", "return torch.exp(q1k1) + torch.exp(q2k2) + self.lambda_init", VARIANTS + ("-k", "differential")),
    Mutation("differential: scaled by 1 + lambda_init", DA, "* second) * (1 - self.lambda_init)", "* second) * (1 + self.lambda_init)", VARIANTS + ("-k", "differential")),
    Mutation("differential: no per-head norm", DA, "return self.head_norm(first - self.lam().to(out.dtype) * second) *", "return (first - self.lam().to(out.dtype) * second) *", VARIANTS + ("-k", "differential")),
    Mutation("differential: kv_layout repeat tiles the key maps instead of repeating each", DA, "return k.repeat_interleave(group, dim=1)", "return k.repeat(1, group, 1, 1)", VARIANTS + ("-k", "differential")),
    Mutation("differential: kv_layout repeat ignored", DA, 'if self.kv_layout == "repeat":', 'if False:', VARIANTS + ("-k", "differential")),
    Mutation("differential: key halves of different groups paired", DA, 'k = rearrange(k, "b (g two) j d -> b g two j d", two=2)', 'k = rearrange(k, "b (two g) j d -> b g two j d", two=2)', VARIANTS + ("-k", "differential")),
    Mutation("muon: biases and gains to Muon", "tfbuilder/train/optimizers.py", "for p in stack.parameters() if p.ndim == 2}", "for p in stack.parameters() if p.ndim >= 1}", OPTIMIZERS),
    Mutation("muon: its rate not relative to the schedule's", "tfbuilder/train/optimizers.py", "lr=(settings.lr or optim.lr) / optim.lr,", "lr=(settings.lr or optim.lr),", OPTIMIZERS),
    Mutation("muon: AdamW's state not restored", "tfbuilder/train/optimizers.py", '        self.adamw.load_state_dict(state_dict["adamw"])\n', "", OPTIMIZERS),
    Mutation("pattern: kinds shifted by one layer", MS, "stack.pattern[index % len(stack.pattern)]]", "stack.pattern[(index + 1) % len(stack.pattern)]]", PATTERNS),
    Mutation("pattern: negative overrides not found", MS, "for key in (index, index - stack.layers):", "for key in (index, index + stack.layers):", PATTERNS),
    Mutation("pattern: the stack's params win over the change", SL, "data = {**base.model_dump(), **change} if", "data = {**change, **base.model_dump()} if", PATTERNS),
    Mutation("pattern: the last index + 1 accepted", ST, "if not -stack.layers <= index < stack.layers", "if not -stack.layers <= index <= stack.layers", PATTERNS),
    Mutation("pattern: value residual switched off in some layers", ST, "if residual[0] != residual[1]:", 'if residual[0] == residual[1] == "x":', PATTERNS),
    Mutation("pattern: the preflight extrapolates layers that differ", "tfbuilder/model/sizing.py", "    if any(stack.pattern or stack.overrides for stack in stacks.values()):", "    if False:", PATTERNS),
    # --- decoding (tfbuilder/inference/decoding.py; Wu et al. 2016's length penalty; fairseq's rules) ----------
    Mutation("beam: stop on the live score, not its bound", BEAMS, "return last | (self.bar[alive] >= bound)", "return last | (self.bar[alive] >= now)", SEARCH),
    Mutation("beam: ended scores normalised by the wrong length", BEAMS, "normalised = ended / length_penalty(step + 1, self.alpha)", "normalised = ended / length_penalty(step, self.alpha)", SEARCH),
    Mutation("beam: length penalty base 6 + |y|", BEAMS, "    return ((5.0 + length) / 6.0) ** alpha", "    return ((6.0 + length) / 6.0) ** alpha", SEARCH),
    Mutation("beam: the greedy path may leave the beam", BEAMS, "index[:, -1] = torch.where(missing, wanted, index[:, -1])", "index[:, -1] = index[:, -1]", SEARCH),
    Mutation("beam: one ended hypothesis too many kept", BEAMS, "del kept[self.nbest :]", "del kept[self.nbest + 1 :]", SEARCH),
    Mutation("beam: the limit does not force </s>", BEAMS, "forced[..., end] = logp.view(n, beam, vocab)[..., end]", "forced[..., end] = float(\"-inf\")", SEARCH + ("tests/test_decoding.py", "-k", "length_limit or reference")),
    Mutation("rules: specials not banned", RULES, "logp.index_fill_(1, never, float(\"-inf\"))", "logp", SEARCH),
    Mutation("rules: <unk> favoured, not penalised", RULES, "logp[:, unk] -= self.unk_penalty", "logp[:, unk] += self.unk_penalty", SEARCH),
    Mutation("rules: n-gram history one token late", RULES, "history[:, None, history.shape[1] - n + 1 :]", "history[:, None, history.shape[1] - n : -1]", SEARCH),
    Mutation("sources: </s> placed one too far", D, "out[rows, lengths[rows]] = end", "out[rows, lengths[rows] + 1] = end", SEARCH),
    Mutation("greedy: the limit counts without </s>", D, "last = step + 1 >= limits[alive]  # the limit counts the closing </s>", "last = step >= limits[alive]", ("tests/test_decoding.py", "-k", "length_limit or sampled")),
    Mutation("ensemble: sum of probabilities, not mean", "tfbuilder/inference/ensemble.py", "return torch.logsumexp(torch.stack(logps), dim=0) - math.log(len(logps))", "return torch.logsumexp(torch.stack(logps), dim=0)", ("tests/test_ensemble.py",)),
    # --- left-padded prompts and decoder-only generation (masks.py, inference/continuation.py; transformers' generate)
    Mutation("left padding: real queries attend to pads", M, "return real[:, None, None, :] | ~real[:, None, -n_query:, None]", "return torch.ones_like(real[:, None, None, :]) | ~real[:, None, -n_query:, None]", PADDED),
    Mutation("left padding: positions not offset by the padding", M, "return (real.long().cumsum(dim=1) - 1).clamp(min=0)", "return (torch.ones_like(real).long().cumsum(dim=1) - 1).clamp(min=0)", PADDED),
    Mutation("left padding: rotary turns by columns, not positions", A, "q, k = position.rotate(q, offset, positions), position.rotate(k, offset, positions)", "q, k = position.rotate(q, offset), position.rotate(k, offset)", PADDED + ("-k", "rotary")),
    Mutation("left padding: a pad id inside a prompt taken for padding", M, "return (ids != pad_id).cumsum(dim=1) > 0", "return ids != pad_id", PADDED + ("-k", "leading")),
    Mutation("left padding: the new token's column not real", C, "return torch.cat([real, torch.ones_like(real[:, :1])], dim=1)", "return torch.cat([real, torch.zeros_like(real[:, :1])], dim=1)", GEN + ("-k", "greedy")),
    Mutation("left padding: every family's pads attended", M, "return real[:, None, None, :] | ~real[:, None, -n_query:, None]", "return torch.ones_like(real[:, None, None, :]) | ~real[:, None, -n_query:, None]", ("tests/test_generation_families.py", "-k", "greedy")),
    Mutation("generation: the minimum length off by default", RULES, "    min_len: int = 1\n", "    min_len: int = 0\n", GEN + ("-k", "minimum")),
    Mutation("generation: the beams' cache not reordered", C, "reorder(cache, select, parts=(\"self\",))  # the cache follows the beams", "pass", PADDED + ("-k", "log_probabilities")),
    Mutation("generation: transformers' beams' cache not reordered", C, "reorder(cache, select, parts=(\"self\",))  # transformers' reorder_cache", "pass", GEN + ("-k", "beam and defaults")),
    Mutation("generation: hypotheses cut at max_new dropped", C, "            search.record_cut(step)\n", "            pass\n", PADDED + ("-k", "log_probabilities")),
    Mutation("transformers beams: length penalty exponent ignored", TB, "scores = top[:, : self.beam] / length**self.length_penalty", "scores = top[:, : self.beam] / length", GEN + ("-k", "beam")),
    Mutation("transformers beams: never stops by max_new", TB, "hypothetical = self.max_new if self.early_stopping == \"never\" and self.length_penalty > 0 else length", "hypothetical = length", GEN + ("-k", "beam")),
    Mutation("transformers beams: ended past the first beam candidates finished", TB, "for i, r in ends[:, : self.beam].nonzero().tolist():", "for i, r in (ends[:, : self.beam] | True).nonzero().tolist():", GEN + ("-k", "beam")),
    # --- gaps found by planting bugs (issue #36): each with the test written for it
    Mutation("store: ids above 65,535 kept in uint16", "tfbuilder/data/tokens.py", "np.uint16 if vocab_size <= 2**16 else", "np.uint16 if vocab_size <= 2**17 else", ("tests/test_store.py", "-k", "narrowest or largest_ids")),
    Mutation("packing: a stored split's last document dropped (its end offset)", "tfbuilder/data/tokens.py", "        return self.owner.examples + 1\n", "        return self.owner.examples\n", ("tests/test_packing.py", "-k", "stored_documents")),
    Mutation("beam: the bound ignores the length still to grow", BEAMS, "now / length_penalty(self.limits[alive], self.alpha), now / length_penalty(step + 2, self.alpha)", "now / length_penalty(step + 2, self.alpha), now / length_penalty(step + 2, self.alpha)", SEARCH + ("-k", "exhaustive")),
    Mutation("latent: a beam reads another input's source", "tfbuilder/model/components/latent_attention.py", "k, v = (t.repeat_interleave(group, dim=0) for t in (k, v))", "k, v = (t.repeat(group, 1, 1, 1) for t in (k, v))", ("tests/test_decoding.py", "-k", "groups_beams")),
    Mutation("muon: AdamW's half never stepped", "tfbuilder/train/optimizers.py", "        self.muon.step()\n        self.adamw.step()\n", "        self.muon.step()\n", OPTIMIZERS + ("-k", "every_parameter")),
    Mutation("z-loss: ignored by the masked LM", "tfbuilder/train/objectives.py", "        documents=documents,\n        z_loss=z_loss,\n    )", "        documents=documents,\n    )", OBJ + ("-k", "z_loss")),
    Mutation("z-loss: ignored by encoder-decoders", "tfbuilder/train/objectives.py", "partial(seq2seq, epsilon=epsilon, z_loss=z_loss)", "partial(seq2seq, epsilon=epsilon)", OBJ + ("-k", "z_loss")),
    Mutation("pattern: the kind applied over the override", MS, "        for changes in steps:\n", "        for changes in reversed(steps):\n", PATTERNS),
    Mutation("moe: top-1 weight renormalised to 1", "tfbuilder/model/components/moe.py", "return self.router == \"sigmoid\" or self.top_k > 1", "return self.router == \"sigmoid\" or self.top_k > 0", ("tests/test_ffn.py", "-k", "moe or switch")),
    Mutation("decoding: the minimum length ignored", RULES, "if step < self.min_len and end is not None:", "if step < 0 and end is not None:", ("tests/test_decoding_search.py", "-k", "exhaustive")),
    Mutation("memory: replicas summed over nodes", "tfbuilder/model/sizing.py", "        return ram, \"this machine's memory\"", "        return ram * nodes, \"this machine's memory\"", ("tests/test_sizing.py",)),
    Mutation("memory: a machine's processes not counted", "tfbuilder/model/sizing.py", "    return ram // processes,", "    return ram,", ("tests/test_sizing.py",)),
    # --- a key in the wrong section, an objective given the wrong kind
    Mutation("did you mean: the key's own section searched", "tfbuilder/spec/problems.py", "(name,) != here and key in section", "(name,) == here and key in section", ("tests/test_recipe_errors.py", "-k", "another_section")),
    # --- the fused loss under autocast; one step numbering in every logger
    Mutation("loss: the weight gradient's product in float32 under autocast", "tfbuilder/train/objectives.py", "rows, t = x[start : start + chunk].to(compute), target", "rows, t = x[start : start + chunk], target", OBJ + ("-k", "autocast")),
    Mutation("paths: the tokenizer path relative to the working directory", "tfbuilder/spec/sources.py", 'FILE_RELATIVE: tuple[Key, ...] = (("data", "path"), ("data", "tokenizer", "path"))', 'FILE_RELATIVE: tuple[Key, ...] = (("data", "path"),)', ("tests/test_recipe_paths.py", "-k", "tokenizer")),
    Mutation("paths: the old-style tokenizer path read over the recipe's", "tfbuilder/spec/recipe.py", 'if files.exists(tokenizer["path"]) or not files.exists(written.value):', "if not files.exists(written.value):", ("tests/test_recipe_paths.py", "-k", "tokenizer")),
    Mutation("run dir: a stopped-early run not started over", "tfbuilder/train/fit.py", "    restart = r.restart or (origin.run_dir is not None and not origin.resumed)", "    restart = r.restart", ("tests/test_faults_runs.py", "-k", "same_command")),
    Mutation("run dir: continued from other weights than it began from", "tfbuilder/train/lifecycle.py", "        if not isinstance(began, str) or Path(began).resolve() != wanted:", "        if not isinstance(began, str):", ("tests/test_faults_runs.py", "-k", "same_command")),
    Mutation("run dir: a run held is started again, not continued", "tfbuilder/train/lifecycle.py", "        if holds_run(shared, restart=True):", "        if False:", ("tests/test_faults_runs.py", "-k", "same_command")),
    Mutation("preemption: SIGUSR1 not handled", "tfbuilder/train/stopping.py", "SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)", "SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)", ("tests/test_stopping.py",)),
    Mutation("preemption: SIGUSR2 not handled", "tfbuilder/train/stopping.py", "SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)", "SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)", ("tests/test_stopping.py", "-k", "sigusr2")),
    Mutation("sweep launch: submitit's notice not handed back", "tfbuilder/use/launch.py", "            signal.raise_signal(signal.SIGUSR2)", "            pass", ("tests/test_sweep_launch.py", "-k", "notice or submitits_signal")),
    Mutation("preemption: requeued after SIGTERM too", "tfbuilder/train/stopping.py", "    if signum != REQUEUE_SIGNAL or not job_id:", "    if not job_id:", ("tests/test_stopping.py",)),
    Mutation("preemption: Lightning's requeue left on", "tfbuilder/train/trainer.py", "    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []", "    return []", ("tests/test_stopping.py",)),
    Mutation("sweep: a worker reports before every run finished", "tfbuilder/cli/sweeps.py", "    if unfinished and not args.report_only:", "    if False:", ("tests/test_sweeps.py", "-k", "workers or entry")),
    Mutation("sweep: --entry runs the whole plan", "tfbuilder/cli/sweeps.py", "    chosen = sweep.runs if args.entry is None else [sweep.runs[args.entry]]", "    chosen = sweep.runs", ("tests/test_sweeps.py", "-k", "workers or entry")),
    Mutation("sweep: --report-only trains", "tfbuilder/cli/sweeps.py", "    todo = [] if args.report_only else [", "    todo = [] if False else [", ("tests/test_sweeps.py", "-k", "workers or entry")),
    Mutation("ranks: the summary counts rank 0's tokens only", "tfbuilder/train/summary.py", "            train_tokens=task.all_ranks[0] if task.all_ranks else task.train_tokens,", "            train_tokens=task.train_tokens,", ("tests/test_training.py", "-k", "ddp")),
    Mutation("ranks: a resume on another world size allowed", "tfbuilder/train/fit.py", "    if isinstance(saved, int) and saved != world:", "    if False:", ("tests/test_faults_runs.py", "-k", "another_number")),
    Mutation("validate: fsdp on an Apple GPU passes", "tfbuilder/train/preflight.py", 'if t.strategy != "fsdp" or t.accelerator != "mps":', "if True:", ("tests/test_preflight.py", "-k", "fsdp")),
    Mutation("geglu: the tanh form ignored", "tfbuilder/model/components/ffn.py", '        if params.approximate == "tanh":\n            self.act = ACTIVATIONS["gelu_tanh"]()', '        if params.approximate == "none":\n            self.act = ACTIVATIONS["gelu_tanh"]()', ("tests/test_ffn.py", "-k", "geglu")),
    Mutation("qk rms: not applied in self-attention", A, "        q, k = self._rms_qk(q, k)\n        if self._shared:", "        if self._shared:", ("tests/test_attention.py", "-k", "rms")),
    Mutation("qk rms: keys not normalised", A, "        return self._normed(self.q_norm, q), self._normed(self.k_norm, k)", "        return self._normed(self.q_norm, q), k", ("tests/test_attention.py", "-k", "rms")),
    Mutation("bias qkv: an output bias too", A, "        self.to_out = nn.Linear(h * self.value_dim, d, bias=params.bias is True)", "        self.to_out = nn.Linear(h * self.value_dim, d, bias=bool(params.bias))", ("tests/test_attention.py", "-k", "bias_qkv")),
    Mutation("preemption: no requeue when SIGUSR1 comes before training", "tfbuilder/train/fit.py", "            requeued = stopping.requeue(stop.signum) if global_rank() == 0 else None", "            requeued = None", ("tests/test_stopping.py",)),
    Mutation("steps: rewind keeps the row of the step after", "tfbuilder/runs/rewind.py", "int(logged) > last else kept", "int(logged) >= last else kept", ("tests/test_faults_runs.py", "-k", "older or console")),
    Mutation("steps: an older run renumbered on resume", "tfbuilder/runs/steps.py", "return 0 if numbering == OPTIMIZER else 1", "return 0", ("tests/test_faults_runs.py", "-k", "older or console")),
    Mutation("steps: curves shifted by one", "tfbuilder/use/results.py", "        step = int(step) + offset\n", "        step = int(step) + 1\n", ("tests/test_faults_runs.py", "-k", "older or console")),
    Mutation("steps: trackers numbered as Lightning counts", "tfbuilder/train/trainer.py", "        log(metrics, step_of())", "        log(metrics, step)", ("tests/test_loggers.py", "-k", "every_logger")),
    Mutation("objective: the model's kind not checked", "tfbuilder/train/objectives.py", "        if not isinstance(model, kind):\n", "        if not isinstance(model, nn.Module):\n", OBJ + ("-k", "another_kind or refuses")),
    # --- validate: what fit would refuse before training, refused by the pre-flight
    Mutation("validate: a packed block counted with the special tokens", PF, '("data", "block_size"), 0', '("data", "block_size"), 1', ("tests/test_validation_rules.py", "-k", "packed")),
    Mutation("validate: every recipe's data skipped as if synthetic", PF, 'if data is None or data.type == "synthetic":\n        return []\n    problems', 'if data is None or data.type != "synthetic":\n        return []\n    problems', PREFLIGHT),
    Mutation("validate: the training file's head not read", PF, "if reader(data.format).rows is not None:", "if reader(data.format).rows is None:", PREFLIGHT + ("-k", "column or head")),
    Mutation("validate: the whole training file read", PF, "islice(rows, HEAD_ROWS)", "islice(rows, None)", PREFLIGHT + ("-k", "head")),
    Mutation("validate: a column's problem at another key", PF, "if name == exc.column", "if name != exc.column", PREFLIGHT + ("-k", "column")),
    Mutation("validate: no did-you-mean for a JSON field", "tfbuilder/data/formats.py", "did_you_mean(name, _names(record))", "did_you_mean(name, [])", PREFLIGHT + ("-k", "column")),
    Mutation("validate: no did-you-mean for a CSV column", "tfbuilder/data/formats.py", "n=1, cutoff=0.6)", "n=1, cutoff=1.6)", PREFLIGHT + ("-k", "column")),
    Mutation("validate: an absent tokenizer file accepted", PF, "tokenizer.facts() is not None:", "tokenizer.facts() is None:", PREFLIGHT + ("-k", "tokenizer")),
    Mutation("validate: --no-data ignored", "tfbuilder/cli/recipes.py", "check(recipe, data=data)", "check(recipe, data=True)", PREFLIGHT + ("-k", "no_data")),
    Mutation("validate: MLflow's store never checked", "tfbuilder/train/loggers.py", 'if name == "mlflow" else None', 'if name != "mlflow" else None', LOGGERS),
    Mutation("validate: a SQLite file's folder not checked", "tfbuilder/train/loggers.py", 'if name != ":memory:" and not path.parent.is_dir():', 'if name == ":memory:" and not path.parent.is_dir():', LOGGERS),
    Mutation("validate: a database URI accepted without SQLAlchemy", "tfbuilder/train/loggers.py", "        if not database:", "        if database:", LOGGERS),
    Mutation("fit: a run set up before a tracker failed is kept", "tfbuilder/train/fit.py", "            claim.discard()  #", "            pass  #", ("tests/test_loggers.py", "-k", "half_made")),
    Mutation("validate: a file store refused MLflow accepts", "tfbuilder/train/loggers.py", "    if not file_store:", "    if file_store:", LOGGERS),
    # Hostile input outside stores and weights: bounds on recipes, command lines, lines and outputs.
    Mutation("recipe: an integer of a component beyond 2^32 accepted", "tfbuilder/params.py", "    _bounded = field_validator(\"*\", mode=\"after\")(bounded)", "    pass", ("tests/test_hostile_recipes.py", "-k", "integer")),
    Mutation("recipe: an integer of a section beyond 2^32 accepted", "tfbuilder/spec/base.py", "    _bounded = field_validator(\"*\", mode=\"after\")(bounded)", "    pass", ("tests/test_hostile_recipes.py", "-k", "integer")),
    Mutation("recipe: the bound of integers one too low", "tfbuilder/params.py", "abs(item) > MAX_INT", "abs(item) >= MAX_INT", ("tests/test_hostile_recipes.py", "-k", "integer")),
    Mutation("recipe: a line longer than the bound read", "tfbuilder/spec/yaml_source.py", "        if len(line) > MAX_LINE:", "        if len(line) > MAX_LINE + 1:", ("tests/test_hostile_recipes.py", "-k", "long_line")),
    Mutation("recipe: values written not counted while composing", "tfbuilder/spec/yaml_source.py", "        self._nodes += 1", "        self._nodes += 0", ("tests/test_hostile_recipes.py", "-k", "composing")),
    Mutation("sweep: --seeds unbounded", "tfbuilder/cli/arguments.py", "    return positive_int(text, MAX_SEEDS)", "    return positive_int(text)", ("tests/test_hostile_inputs.py", "-k", "counts_on_the_command_line")),
    Mutation("synthetic: the token bound off by one", "tfbuilder/spec/sections.py", "            if biggest > MAX_SYNTHETIC_TOKENS:", "            if biggest > MAX_SYNTHETIC_TOKENS + 200_000:", ("tests/test_validation_rules.py", "-k", "synthetic")),
    Mutation("translate: a long line read whole", "tfbuilder/inference/translate.py", "            ids[i] = x[:max_source]", "            ids[i] = x", ("tests/test_hostile_inputs.py", "-k", "cut_line")),
    Mutation("translate: a learned table's end token not left room", "tfbuilder/inference/translate.py", "max(1, limit - TRANSLATION_ADDED)", "max(1, limit)", ("tests/test_hostile_inputs.py", "-k", "learned_position")),
    Mutation("attention maps: one token more than the bound drawn", "tfbuilder/use/attention_maps.py", "    if tokens > MAX_MAP_TOKENS:", "    if tokens >= MAX_MAP_TOKENS:", ("tests/test_hostile_inputs.py", "-k", "attention_map")),
    Mutation("evaluation batches: a long example pads its batch", "tfbuilder/data/datamodule.py", "            budget = size * self.data.max_len", "            budget = None", ("tests/test_batching.py", "-k", "long_validation")),
    Mutation("batching: batch_size ignored beside a token budget", "tfbuilder/data/batching.py", " | (count > most)", "", ("tests/test_batching.py", "-k", "long_validation")),
    Mutation("atomic: the clean-up of a temporary raises", "tfbuilder/atomic.py", "    except OSError:\n        pass\n\n\ndef fsync_dir", "    except FileNotFoundError:\n        pass\n\n\ndef fsync_dir", ("tests/test_atomic.py", "-k", "read_only")),
    Mutation("atomic: a new file's error names its temporary", "tfbuilder/atomic.py", "f\"cannot write {what} {path}: {exc.reason} (nothing was written)\"", "str(exc)", ("tests/test_atomic.py", "-k", "read_only")),
    Mutation("outputs: a folder that cannot be written accepted", "tfbuilder/cli/arguments.py", "    if not os.access(parent, os.W_OK | os.X_OK):", "    if False:", ("tests/test_hostile_inputs.py", "-k", "cannot_be_written")),
    Mutation("export: --out not checked before the work", "tfbuilder/cli/interop.py", "    directory_arg(args.out, \"--out\")  # before the checkpoint is read", "    pass", ("tests/test_hostile_inputs.py", "-k", "under_a_file")),
    Mutation("inputs: a symlink loop called missing", "tfbuilder/streams.py", "        if exc.errno == errno.ELOOP:\n            return \"a loop of symbolic links\"\n        if exc.errno in", "        if exc.errno == errno.ENOENT and False:\n            return \"a loop of symbolic links\"\n        if exc.errno in", ("tests/test_hostile_inputs.py", "-k", "words")),
    Mutation("translate: a failing read is a traceback", "tfbuilder/cli/decoding.py", "        except OSError as exc:\n            raise TfbuilderError(f\"cannot read {name}", "        except KeyError as exc:\n            raise TfbuilderError(f\"cannot read {name}", ("tests/test_hostile_inputs.py", "-k", "not_files")),
    Mutation("translate: a failed run's empty --output left behind", "tfbuilder/cli/decoding.py", "        if sink.tell() == 0:", "        if sink.tell() < 0:", ("tests/test_hostile_inputs.py", "-k", "no_output_file")),
    Mutation("text: blank lines in a row not counted", "tfbuilder/data/text.py", "                blank = blank + 1 if raw in (b\"\\n\", b\"\\r\\n\") else 0", "                blank = 0", ("tests/test_data.py", "-k", "blank")),
    Mutation("text: a line with \\r\\n not counted as blank", "tfbuilder/data/text.py", "raw in (b\"\\n\", b\"\\r\\n\")", "raw in (b\"\\n\",)", ("tests/test_data.py", "-k", "blank")),
    # --- the prepared store trusts none of its own files (tfbuilder/data/store.py, storefiles.py)
    Mutation("store trust: a store file's link followed", SF, "os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK", "os.O_RDONLY | os.O_NONBLOCK", (FS, "-k", "no_regular_file and _zero")),
    Mutation("store trust: a file read before its size is checked", SF, "        if size > limit:\n", "        if size >= 2**63:\n", (FS, "-k", "bounded_read or sparse")),
    Mutation("store trust: closest() reads every store's meta.json", SS, "reverse=True)[:CLOSEST_STORES]", "reverse=True)[:]", (FS, "-k", "closest")),
    Mutation("store trust: a held lock waited on in minutes, not seconds", SK, "deadline = time.monotonic() + timeout\n", "deadline = time.monotonic() + timeout * 60\n", (FS, "-k", "gives_up")),
    Mutation("store trust: a renewing holder given up on", SK, "            seen, deadline = renewed, time.monotonic() + timeout", "            seen = renewed", (FS, "-k", "renews_its_lock")),
    Mutation("store trust: the lock's default wait of 30 minutes", SK, "LOCK_TIMEOUT = 30 * 60", "LOCK_TIMEOUT = 30 * 6", (FS, "-k", "released_while")),
    Mutation("store trust: the lock's holder line left behind", SK, "            os.ftruncate(fd, 0)\n            fcntl.flock(fd, fcntl.LOCK_UN)", "            fcntl.flock(fd, fcntl.LOCK_UN)", (FS, "-k", "released_while")),
    Mutation("store trust: the lock file's link followed", "tfbuilder/streams.py", "flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode", "flags | os.O_NONBLOCK | os.O_CLOEXEC, mode", (FS, "-k", "lock_that_is_no_plain")),
    Mutation("fit.lock: opened through a link", "tfbuilder/streams.py", "flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode", "flags | os.O_NONBLOCK | os.O_CLOEXEC, mode", ("tests/test_faults_runs.py", "-k", "lock")),
    Mutation("fit.lock: a hard link taken for a file of its own", "tfbuilder/streams.py", "info.st_nlink > 1:", "info.st_nlink > 2:", ("tests/test_faults_runs.py", "-k", "lock")),
    Mutation("store trust: a lock that cannot be created is a traceback", SK, "        fd, what = open_own(path, os.O_RDWR | os.O_CREAT)\n    except OSError as exc:", "        fd, what = open_own(path, os.O_RDWR | os.O_CREAT)\n    except ValueError as exc:", (FS, "-k", "under_proc")),
    Mutation("store trust: offsets not checked to start at 0", SF, "if first == 0 and offsets[0] != 0:", "if first == 1 and offsets[0] != 0:", (FS, "-k", "idx_not_from_0")),
    Mutation("store trust: decreasing offsets not seen", SF, "if (steps < 0).any():", "if (steps < -1).any():", (FS, "-k", "idx_decreasing")),
    Mutation("store trust: offsets that end short of the tokens", SF, "if previous != tokens:", "if previous > tokens:", (FS, "-k", "idx_end")),
    Mutation("store trust: lengths not held against the offsets", SF, "np.array_equal(lengths, steps[1:] if first == 0 else steps)", "np.array_equal(lengths, lengths)", (FS, "-k", "len_not_idx")),
    Mutation("store trust: an id of the vocabulary's size kept", "tfbuilder/data/prepare.py", "        if largest >= size:", "        if largest > size:", (FS, "-k", "id_at_vocab_size")),
    Mutation("store trust: a checksum recorded but not compared", SF, "if recorded[0] != size or recorded[1] != got:", "if recorded[0] != size:", (FS, "-k", "only_a_checksum")),
    Mutation("store trust: a whole file's checksum not compared", SS, "if [len(data), storefiles.digest_of(data)] != sums[path.name]:", "if [len(data)] != sums[path.name][:1]:", (FS, "-k", "another_valid_one")),
    Mutation("store trust: a count in meta.json that is text", SS, "if type(value) is not int or value < 0:", "if type(value) is not int and value < 0:", (FS, "-k", "wrong_shape and text")),
    Mutation("store trust: a split named as a path", SS, "        if name not in SPLIT_NAMES:", "        if name in SPLIT_NAMES[:0]:", (FS, "-k", "wrong_shape and path")),
    Mutation("store trust: a store folder that is a link is read", SS, "        info = os.lstat(path)\n", "        info = os.stat(path)\n", (FS, "-k", "file_or_a_link")),
    Mutation("store trust: a damaged tokenizer.json is a plain error", "tfbuilder/data/prepare.py", "    except DataError as exc:\n        raise store.Damaged(opened.path", "    except ValueError as exc:\n        raise store.Damaged(opened.path", (FS, "-k", "damaged_tokenizer")),
    Mutation("store trust: damage prepared again in silence", "tfbuilder/data/prepare.py", "        damaged[path] = exc.what", "        pass", (FS, "-k", "only_a_checksum")),
    Mutation("store trust: a store that cannot be replaced is a traceback", SS, "        except OSError as exc:\n            raise DataError(\n                f\"cannot replace", "        except ValueError as exc:\n            raise DataError(\n                f\"cannot replace", (FS, "-k", "cannot_be_replaced")),
    Mutation("store trust: a full disk not named", "tfbuilder/data/prepare.py", "if exc.errno in (errno.ENOSPC, errno.EDQUOT):", "if exc.errno in (errno.EDQUOT,):", (FS, "-k", "full_disk")),
    Mutation("store trust: offsets changed under a reader read as negative sizes", "tfbuilder/data/tokens.py", "if not 0 <= start <= end:", "if not 0 <= start:", (FS, "-k", "changed_after")),
    # --- weights and tokenizers from elsewhere (tests/test_faults_weights.py)
    Mutation("tokenizer.json: a Replace's length not bounded", TP, "    if factor > MAX_EXPANSION:\n        field", "    if factor < MAX_EXPANSION:\n        field", FW + ("-k", "unbounded_memory")),
    Mutation("tokenizer.json: nested Replaces added, not multiplied", TP, "factor *= _expansion(", "factor += _expansion(", FW + ("-k", "unbounded_memory")),
    Mutation("tokenizer.json: Sequence depth not counted", TP, 'f"{key}.{inner}[{n}]", depth + 1,', 'f"{key}.{inner}[{n}]", depth - 1,', FW + ("-k", "unbounded_memory")),
    Mutation("tokenizer.json: an id equal to the token count accepted", TP, "not 0 <= i < bound:", "not 0 <= i <= bound:", FW + ("-k", "unbounded_memory")),
    Mutation("tokenizer: a Rust panic not caught", TP, 'return type(exc).__name__ == "PanicException"', 'return type(exc).__name__ != "PanicException"', FW + ("-k", "backtracks or panic")),
    Mutation("import-hf: shapes checked only after the model is built", "tfbuilder/interop/hf/convert.py", "    weights.check_shapes(rules, _read_shapes(weights_file), shapes", "    (rules, _read_shapes(weights_file), shapes", FW + ("-k", "wider_than")),
    Mutation("import-hf: NaN weights accepted", "tfbuilder/interop/hf/weights.py", "torch.isfinite(tensor).all()", "torch.isfinite(tensor).any()", FW + ("-k", "non_finite_or_integer")),
    Mutation("import-hf: integer weights accepted", "tfbuilder/interop/hf/weights.py", "if not tensor.is_floating_point():", "if not tensor.is_floating_point() and False:", FW + ("-k", "non_finite_or_integer")),
    Mutation("import-hf: a FIFO tokenizer.json taken for none", "tfbuilder/interop/hf/convert.py", "    if not tok_file.exists():", "    if not tok_file.is_file():", FW + ("-k", "fifo")),
    Mutation("checkpoint: a misshapen weight not named", "tfbuilder/runs/checkpoints.py", "if k in state and tuple(state[k].shape) != tuple(v)", "if k in state and tuple(state[k].shape) == tuple(v)", FW + ("-k", "another_shape")),
    Mutation("checkpoint: missing weights not named before the build", "tfbuilder/runs/checkpoints.py", "        if not problems:  # a model this machine holds", "        if problems:  # a model this machine holds", FW + ("-k", "missing_many")),
    Mutation("checkpoint: weights loaded without naming what does not fit", "tfbuilder/runs/checkpoints.py", "    fits(model, state, source=ckpt_path)", "    (model, state, ckpt_path)", FW + ("-k", "missing_a_weight")),
    Mutation("--init-from: NaN weights not refused", "tfbuilder/train/lifecycle.py", "weights = finite_weights(source, source_path)", "weights = finite_weights({'state_dict': {}}, source_path) or {k[6:]: v for k, v in source['state_dict'].items()}", FW + ("-k", "init_from_a_checkpoint_with_nan")),
    Mutation("checkpoint: a stored tokenizer's failure does not name the checkpoint", "tfbuilder/runs/checkpoints.py", "(BPETokenizer, HFTokenizer, PretrainedTokenizer)", "(BPETokenizer, PretrainedTokenizer)", FW + ("-k", "stored_tokenizer_that_panics")),
    Mutation("--init-from: a damaged stored vocabulary not named", "tfbuilder/train/lifecycle.py", "            stored_vocab(source, init_from),", '            Vocab.from_json(source["tfbuilder"]["vocab"]),', FW + ("-k", "init_from_a_checkpoint_with_a_stored")),
    Mutation("average: sums written into an expanded float64 tensor", "tfbuilder/runs/averaging.py", "v.to(torch.float64, copy=True)", "v.to(torch.float64, copy=False)", FW + ("-k", "expanded")),
    # --- rotary's knobs: partial rotary (GPT-NeoX's rotary_pct), position interpolation, Llama 3.1's scaling
    Mutation("rotary: partial rotates the last features, not the first", P, "turned, rest = x[..., :r], x[..., r:]", "turned, rest = x[..., k - r :], x[..., : k - r]", POS),
    Mutation("rotary: partial rotation's sin on the wrong side", P, "turned * cos + rotary_partners(turned, self.pairing) * sin, rest", "turned * sin + rotary_partners(turned, self.pairing) * cos, rest", POS),
    Mutation("rotary: linear scaling multiplies the frequencies", RS, "return inv_freq / self.factor\n", "return inv_freq * self.factor\n", POS),
    Mutation("rotary: llama3 smoothing sign", RS, "between = (1 - smooth)", "between = (1 + smooth)", POS),
    Mutation("rotary: llama3 short wavelengths not kept", RS, "torch.where(wavelength < context / self.high_freq_factor", "torch.where(wavelength > context / self.high_freq_factor", POS),
    # --- rotary scaling for longer contexts: YaRN (Peng et al. 2023), LongRoPE (Ding et al. 2024), DeepSeek's softmax scale
    Mutation("yarn: ramp reversed (the high frequencies interpolated)", RS, "return inv_freq / self.factor * ramp + inv_freq * (1 - ramp)", "return inv_freq / self.factor * (1 - ramp) + inv_freq * ramp", SCALING),
    Mutation("yarn: beta_fast and beta_slow swapped", RS, "low, high = pair(self.beta_fast), pair(self.beta_slow)", "low, high = pair(self.beta_slow), pair(self.beta_fast)", SCALING),
    Mutation("yarn: correction dim without 2 pi", RS, "context / (rotations * 2 * math.pi)", "context / rotations", SCALING),
    Mutation("yarn: truncate rounds inwards", RS, "low, high = math.floor(low), math.ceil(high)", "low, high = math.ceil(low), math.floor(high)", SCALING),
    Mutation("yarn: mscale linear in the factor, not its log", RS, "0.1 * mscale * math.log(scale) + 1.0", "0.1 * mscale * scale + 1.0", SCALING),
    Mutation("yarn: mscale ratio inverted", RS, "yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)", "yarn_mscale(self.factor, self.mscale_all_dim) / yarn_mscale(self.factor, self.mscale)", SCALING),
    Mutation("rotary: scaling's attention factor not applied to cos/sin", P, "factor = 1.0 if scaling is None else scaling.table_factor()", "factor = 1.0", SCALING),
    Mutation("latent: yarn softmax scale dropped", "tfbuilder/model/components/latent_attention.py", "self.scale = 1.0 / math.sqrt(self.key_dim) * yarn_score_scale(position)", "self.scale = 1.0 / math.sqrt(self.key_dim)", SCALING + ("-k", "deepseek")),
    Mutation("latent: yarn softmax scale not squared", RS, "yarn_mscale(self.factor, self.mscale_all_dim) ** 2 if", "yarn_mscale(self.factor, self.mscale_all_dim) ** 1 if", SCALING + ("-k", "deepseek")),
    Mutation("longrope: long factors from the original length itself", RS, "return length > self.original_max_position_embeddings", "return length >= self.original_max_position_embeddings", SCALING),
    Mutation("longrope: choice ignores the cache offset", P, "self.scaling.is_long(offset + n)", "self.scaling.is_long(n)", SCALING),
    Mutation("longrope: short and long factors swapped", RS, "self.long_factor if long else self.short_factor", "self.short_factor if long else self.long_factor", SCALING),
    Mutation("longrope: long calls read the short table", P, "cos, sin = (self.cos_long, self.sin_long) if long else (self.cos, self.sin)", "cos, sin = (self.cos, self.sin) if long else (self.cos, self.sin)", SCALING),
    Mutation("longrope: attention factor without the log of the context", RS, "math.sqrt(1 + math.log(factor) / math.log(self.original_max_position_embeddings))", "math.sqrt(1 + math.log(factor))", SCALING),
    Mutation("longrope: factor lists checked against the width, not the pairs", RS, "if len(self.short_factor) != width // 2:", "if len(self.short_factor) != width:", SCALING),
    # --- positions per layer kind (Gemma 3's local and global rotary bases)
    Mutation("layer positions: a kind's position change ignored", B, "if params == self.spec.position:", "if True:", LP),
    Mutation("layer positions: position not a layer family", ST, 'LAYER_FAMILIES = ("attention", "ffn", "norm", "position")', 'LAYER_FAMILIES = ("attention", "ffn", "norm")', LP),
    Mutation("layer positions: equal params not shared", B, "module = next((m for p, m in built if p == params), None)", "module = None", LP),
    Mutation("layer positions: a none layer keeps the model's", B, "out.append(module if isinstance(module, AttentionPosition) else None)", "out.append(module if isinstance(module, AttentionPosition) else shared)", LP),
    Mutation("layer positions: additive model position accepted", ST, "if not acts_in_attention(base.type):", "if False:", LP),
    Mutation("layer positions: not owned by the stack", "tfbuilder/model/blocks.py", "self.positions = nn.ModuleList(positions) if positions else None", "self.positions = None", LP),
    # --- sweeps launched through submitit, and docs/gpu.md's SLURM job-array script
    Mutation("sweep launch: a job runs the next entry", "tfbuilder/use/launch.py", 'self.command([*self.argv, "--entry", str(self.index)])', 'self.command([*self.argv, "--entry", str(self.index + 1)])', ("tests/test_sweep_launch.py", "-k", "requeues_as_itself")),
    Mutation("sweep launch: a stopped job not requeued", "tfbuilder/use/launch.py", "        return DelayedSubmission(self)", "        return None  # type: ignore[return-value]", ("tests/test_sweep_launch.py", "-k", "requeues_as_itself")),
    Mutation("sweep launch: a requeued job starts another entry", "tfbuilder/use/launch.py", "        return DelayedSubmission(self)", "        return DelayedSubmission(Entry(self.command, self.argv, 0))", ("tests/test_sweep_launch.py", "-k", "requeues_as_itself")),
    Mutation("sweep launch: entries numbered from 1", "tfbuilder/cli/launching.py", "for index in range(len(sweep.runs))]", "for index in range(1, len(sweep.runs) + 1)]", ("tests/test_sweep_launch.py", "-k", "local_launch")),
    Mutation("sweep launch: returns without waiting", "tfbuilder/cli/launching.py", "    if args.no_wait:", "    if True:", ("tests/test_sweep_launch.py", "-k", "local_launch")),
    Mutation("slurm script: every array task runs entry 0", "docs/gpu.md", 'srun "${sweep[@]}" --entry "$SLURM_ARRAY_TASK_ID"', 'srun "${sweep[@]}" --entry 0', ("tests/test_sweep_launch.py", "-k", "documented")),
    Mutation("slurm script: the report waits for no job", "docs/gpu.md", '--dependency=afterany:"$job"', '--dependency=afterany:"${SLURM_JOB_ID:-}"', ("tests/test_sweep_launch.py", "-k", "documented")),
    Mutation("sweep launch: --slurm-array-parallelism dropped", "tfbuilder/use/launch.py", "        slurm_array_parallelism=resources.array_parallelism,\n", "", ("tests/test_sweep_launch.py", "-k", "on_slurm")),
    Mutation("sweep launch: --slurm-time ignored", "tfbuilder/use/launch.py", "        timeout_min=resources.timeout_min,", "        timeout_min=DAY_MIN,", ("tests/test_sweep_launch.py", "-k", "on_slurm")),
    # --- DeepSeek-V3 and Qwen2-MoE as Hugging Face families (interop/hf/sparse.py, weights.py, convert.py)
    Mutation("hf deepseek: rope_interleave ignored", HS, 'model["position"]["pairing"] = "interleaved" if interleave else "half"', 'model["position"]["pairing"] = "half"', HFF + ("-k", "deepseek_v3_variants")),
    Mutation("hf deepseek: export writes rope_interleave true", HS, '"rope_interleave": pairing == "interleaved",', '"rope_interleave": True,', HFF + ("-k", "round_trips and deepseek_v3")),
    Mutation("hf deepseek: q_lora_rank null read as the default", HS, 'None if "q_lora_rank" in cfg and cfg["q_lora_rank"] is None else ', "", HFF + ("-k", "deepseek_v3_variants")),
    Mutation("hf deepseek: correction bias not loaded", HW, 'out.append((f"{ours}.correction_bias", (f"{sparse}.gate.e_score_correction_bias",), "copy"))', "pass", HFF + ("-k", "import_gives and deepseek_v3")),
    Mutation("hf deepseek: n_group ignored", HS, '"groups": read_int(cfg, "n_group", 8),', '"groups": 1,', HFF + ("-k", "import_gives and deepseek_v3")),
    Mutation("hf deepseek: topk_group ignored", HS, '"top_groups": read_int(cfg, "topk_group", 4),', '"top_groups": 4,', HFF + ("-k", "import_gives and deepseek_v3")),
    Mutation("hf deepseek: routed_scaling_factor ignored", HS, '"routed_scale": read_float(cfg, "routed_scaling_factor", 2.5),', '"routed_scale": 1.0,', HFF + ("-k", "import_gives and deepseek_v3")),
    Mutation("hf deepseek: norm_topk_prob ignored", HS, '"normalize": _flag(cfg, "norm_topk_prob", True),', '"normalize": True,', HFF + ("-k", "import_gives and deepseek_v3")),
    Mutation("hf deepseek: first_k_dense_replace off by one", HS, "return list(range(min(first, layers)))", "return list(range(min(first + 1, layers)))", HFF + ("-k", "import_gives and deepseek_v3")),
    Mutation("hf deepseek: shared experts' names", "tfbuilder/interop/hf/families.py", 'shared_name="shared_experts",', 'shared_name="shared_expert",', HFF + ("-k", "import_gives and deepseek_v3")),
    Mutation("hf deepseek: export compares aux_weight", "tfbuilder/interop/hf/convert.py", 'ffn.pop("aux_weight", None)', "pass", HFF + ("-k", "architecture_recipe and deepseek")),
    Mutation("hf deepseek: export compares an unresolved normalize", "tfbuilder/interop/hf/convert.py", 'ffn["normalize"] = moe.normalizes()', "pass", HFF + ("-k", "architecture_recipe and deepseek")),
    Mutation("hf deepseek: export compares an unresolved shared_hidden", "tfbuilder/interop/hf/convert.py", 'ffn["shared_hidden"] = moe.shared_hidden or moe.hidden * moe.shared_experts', "pass", HFF + ("-k", "architecture_recipe and deepseek")),
    Mutation("hf qwen2-moe: shared expert gate not loaded", HW, 'out.append((f"{ours}.shared_gate.weight", (f"{sparse}.shared_expert_gate.weight",), "copy"))', "pass", HFF + ("-k", "import_gives and qwen2_moe")),
    Mutation("hf qwen2-moe: shared expert ungated", HS, 'model["ffn"]["shared_gate"] = True', 'model["ffn"]["shared_gate"] = False', HFF + ("-k", "import_gives and qwen2_moe")),
    Mutation("hf qwen2-moe: decoder_sparse_step ignored", HS, "return [i for i in range(layers) if i in only or (i + 1) % step]", "return [i for i in range(layers) if i in only]", HFF + ("-k", "import_gives and qwen2_moe")),
    Mutation("hf qwen2-moe: qkv_bias ignored", HS, 'model["attention"]["bias"] = "qkv" if _flag(cfg, "qkv_bias", True) else False', 'model["attention"]["bias"] = "qkv"', HFF + ("-k", "import_gives and qwen2_moe")),
    Mutation("hf qwen2-moe: export writes no mlp_only_layers", HS, "out.update(decoder_sparse_step=1, mlp_only_layers=dense)", "out.update(decoder_sparse_step=1, mlp_only_layers=[])", HFF + ("-k", "round_trips and qwen2_moe")),
    Mutation("hf bert head: pooler without tanh", "tfbuilder/model/heads.py", "pooled = torch.tanh(self.pooler(pooled))", "pooled = self.pooler(pooled)", HFF + ("-k", "bert_with_a_sequence_head")),
    Mutation("hf bert head: classifier bias not written", "tfbuilder/interop/hf/classify.py", '("head.out.bias", ("classifier.bias",), "copy"),', "", HFF + ("-k", "bert_with_a_sequence_head")),
    Mutation("hf bert head: pooler names", "tfbuilder/interop/hf/classify.py", '("head.pooler.weight", ("bert.pooler.dense.weight",), "copy"),', '("head.pooler.weight", ("bert.pooler.weight",), "copy"),', HFF + ("-k", "bert_with_a_sequence_head")),
    Mutation("hf bert head: a head without pooler accepted", "tfbuilder/interop/hf/classify.py", '("pooler", head.pooler, True)', '("pooler", True, True)', HFF + ("-k", "bert_head_transformers")),
    Mutation("hf deepseek: quantized weights read as plain ones", HD, 'require(cfg, "quantization_config", (None,), None)', "pass", HFF + ("-k", "cannot_express and deepseek_v3")),
    Mutation("hf qwen2-moe: export writes num_local_experts", HD, '{fam.experts_field: ffn.get("experts")', '{"num_local_experts": ffn.get("experts")', HFF + ("-k", "round_trips and qwen2_moe")),
    # --- runs under a cluster launcher (torchrun, SLURM): every rank refuses what rank 0 refuses
    Mutation("distributed runs: its own job's lock taken for another's", JL, "(ours and tag == ours)", "(ours and tag != ours)", (DR, "-k", "lock_names")),
    Mutation("distributed runs: the parent's lock taken for another's", JL, "pid == os.getppid()", "pid == os.getpid()", (DR, "-k", "parent")),
    Mutation("distributed runs: a held lock seen as free", JL, "            return _other(fd)", "            return None", (DR, "-k", "lock_names")),
    Mutation("distributed runs: the SLURM job not named", JL, 'return f"slurm {slurm}"', 'return ""', (DR, "-k", "lock_names")),
    Mutation("distributed runs: the lock's line names no job", "tfbuilder/runs/checkpoints.py", 'tag = f" job {joblock.job()}" if joblock.job() else ""', 'tag = ""', (DR, "-k", "lock_names")),
    Mutation("distributed runs: rank 1 never refuses a lock another job holds", "tfbuilder/train/lifecycle.py", "            if holder is not None:\n                raise in_use(", "            if False:\n                raise in_use(", (DR, "-k", "refusal and lock")),
    Mutation("distributed runs: every rank speaks of the checkpoint", "tfbuilder/train/trainer.py", "if not self.trainer.is_global_zero:", "if False:", (DR, "-k", "sigterm")),
    # --- ranks: the global data position, train_loss reduced over ranks, the world-size check
    Mutation("ranks: position off by one", BA, "return epoch, done + steps * world", "return epoch, done + steps * world + 1", RANKS),
    Mutation("ranks: position without the world-size factor", BA, "return epoch, done + steps * world", "return epoch, done + steps", RANKS),
    Mutation("ranks: next epoch's position without the world-size factor", BA, "steps % per_epoch * world", "steps % per_epoch", RANKS),
    Mutation("ranks: steps left in the epoch not counted", BA, "left = (count - done) // world", "left = count // world", RANKS),
    Mutation("ranks: a rank's share ignores the position", BA, "return slice(done + rank, end, world)", "return slice(rank, end, world)", RANKS),
    Mutation("ranks: train_loss summed over ranks", TK, "self.last_train_loss = total / count.clamp(min=1)", "self.last_train_loss = total", RANKS_DDP),
    Mutation("ranks: train_loss not weighted by tokens", TK, "weighted = torch.stack([loss.detach().double() * tokens, tokens.double()])", "weighted = torch.stack([loss.detach().double(), torch.ones_like(tokens).double()])", RANKS_DDP),
    Mutation("ranks: train_loss rank 0's own", TK, "total, count = self.trainer.strategy.reduce(weighted, reduce_op=\"sum\")", "total, count = weighted", RANKS_DDP),
    Mutation("ranks: a global position refused on another world size", "tfbuilder/train/fit.py", 'origin.source is None or "data_position" in origin.source["tfbuilder"]:', "origin.source is None:", RANKS_DDP),
    Mutation("ranks: launched processes without a run directory not refused", "tfbuilder/train/fit.py", "if world > 1 and launched and origin.run_dir is None:", "if False:", ("tests/test_ranks.py", "-k", "need_one_run_directory")),
    # --- FSDP2 and activation checkpointing (tfbuilder/train/sharding.py, tfbuilder/runs/sharded.py)
    Mutation("fsdp: only the root wrapped, not each layer", "tfbuilder/train/sharding.py", "        fully_shard(block, mesh=mesh, mp_policy=policy)\n", "        pass\n", ("tests/test_fsdp.py", "-k", "shard_wraps")),
    Mutation("fsdp: gradients reduced in the compute dtype", "tfbuilder/train/sharding.py", "MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)", "MixedPrecisionPolicy(param_dtype=half, reduce_dtype=half)", ("tests/test_fsdp.py", "-k", "mixed_precision or shard_wraps")),
    Mutation("fsdp: ranks compare their shards", "tfbuilder/train/sharding.py", "full = p.full_tensor() if isinstance(p, DTensor) else p", "full = p.to_local() if isinstance(p, DTensor) else p", ("tests/test_fsdp.py", "-k", "shards_every_layer")),
    Mutation("activation checkpointing: never recomputes", "tfbuilder/train/sharding.py", "            if not (_block.training and torch.is_grad_enabled()):", "            if True:", ("tests/test_fsdp.py", "-k", "activation_checkpointing")),
    Mutation("activation checkpointing: the recipe's switch ignored", "tfbuilder/train/task.py", "        if self.recipe.trainer.activation_checkpointing:", "        if False:", ("tests/test_fsdp.py", "-k", "activation_checkpointing")),
    Mutation("sharded reader: the shards not read", "tfbuilder/runs/sharded.py", "        dcp.load({\"state_dict\": state}, storage_reader=_SafeReader(folder), no_dist=True)", "        pass", ("tests/test_fsdp.py", "-k", "loads_in_one_process")),
    Mutation("sharded reader: the optimizer's tensors read as weights", "tfbuilder/runs/sharded.py", "        if not key.startswith(WEIGHTS):", "        if key.startswith(WEIGHTS):", ("tests/test_fsdp.py", "-k", "loads_in_one_process")),
    Mutation("sharded reader: pieces outside the folder read", "tfbuilder/runs/sharded.py", "Path(name).name != name or ", "", ("tests/test_fsdp.py", "-k", "damaged_index")),
    Mutation("sharded reader: the index unpickled unrestricted", "tfbuilder/runs/sharded.py", "        if (module, name) in _ALLOWED:", "        if True:", ("tests/test_fsdp.py", "-k", "damaged_index")),
]


def copy_tree(dest: Path) -> None:
    """This checkout's sources and tests, as they are now (uncommitted edits included)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".venv", ".git", "site")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)


def pytest(tree: Path, args: tuple[str, ...], timeout: float) -> str:
    """Run the selection in ``tree``: 'pass', 'fail', 'timeout', 'no tests' or 'error'. Test files
    that do not exist (yet) are left out; a selection with none is 'no tests'."""
    kept: list[str] = []
    for i, arg in enumerate(args):
        is_path = not arg.startswith("-") and (i == 0 or args[i - 1] != "-k")
        if not is_path or (tree / arg.split("::")[0]).exists():
            kept.append(arg)
    if not any(not a.startswith("-") and (i == 0 or kept[i - 1] != "-k") for i, a in enumerate(kept)):
        return "no tests"
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    # -m "": the cluster tests too (the suite's default leaves them out), where a mutation names them
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-m", "", *kept]
    try:
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    return {0: "pass", 1: "fail", 2: "fail", 5: "no tests"}.get(done.returncode, "error")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", action="append", default=[], help="run the mutations whose name contains this (repeatable: any)"
    )
    parser.add_argument(
        "--changed-since", metavar="REV", help="run only the mutations of files that differ from git revision REV"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per test run")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or any(part in m.name for part in args.only)]
    if args.changed_since:
        diff = subprocess.run(["git", "diff", "--name-only", args.changed_since, "--", "tfbuilder"], cwd=ROOT,
                              capture_output=True, text=True, check=True)
        changed = set(diff.stdout.split())
        chosen = [m for m in chosen if m.file in changed]
    if args.list:
        for m in chosen:
            print(f"{m.file}: {m.name}  [{' '.join(m.tests)}]")
        return 0
    # A termination request unwinds like Ctrl-C: the running tests are stopped and the copy deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tree = Path(tempfile.mkdtemp(prefix="tfbuilder-mutation-"))
    try:
        copy_tree(tree)
        probe = subprocess.run([sys.executable, "-c", "import tfbuilder; print(tfbuilder.__file__)"], cwd=tree,
                               env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True)
        if not probe.stdout.startswith(str(tree)):
            print(f"the copy does not import its own tfbuilder ({probe.stdout.strip() or probe.stderr.strip()})")
            return 2
        baseline: dict[tuple[str, ...], str] = {}
        killed = 0
        for m in chosen:
            target = tree / m.file
            source = target.read_text(encoding="utf-8")
            if source.count(m.original) != 1:
                print(f"stale     {m.name}  ({m.file}: the snippet occurs {source.count(m.original)} times)")
                continue
            if m.tests not in baseline:
                baseline[m.tests] = pytest(tree, m.tests, args.timeout)
            if baseline[m.tests] != "pass":
                print(f"SURVIVED  {m.name}  (unmutated, the tests give '{baseline[m.tests]}': {' '.join(m.tests)})")
                continue
            start = time.monotonic()
            try:
                target.write_text(source.replace(m.original, m.replacement), encoding="utf-8")
                outcome = pytest(tree, m.tests, args.timeout)
            finally:
                target.write_text(source, encoding="utf-8")
            took = time.monotonic() - start
            if outcome in ("fail", "timeout"):
                killed += 1
                print(f"killed    {m.name}  ({took:.0f} s{', timeout' if outcome == 'timeout' else ''})", flush=True)
            else:
                print(f"SURVIVED  {m.name}  ({outcome}: {' '.join(m.tests)})", flush=True)
        print(f"killed {killed} of {len(chosen)}")
        return 0 if killed == len(chosen) else 1
    finally:
        shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
